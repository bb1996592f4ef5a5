"""How kernels reach the simulator: capture (JAX's interpret hook -> KernelLaunch),
ps.estimate on shapes (shapes_only), what kernel code sees of the device while
traced (device), and every JAX internal the simulator reads (jax_internals)."""
