"""What is read off a kernel's jaxpr before anything runs: one walker over its
equations (walker), SMEM and barrier resources (resources), the lowering's SMEM
swizzle, which blocks do the same work (block_classes, congruence) and the path
each block takes (paths)."""
