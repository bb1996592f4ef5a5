"""How a Hopper GPU computes what numpy would round differently: the tensor
core's sums (tensor_core), division (division), and correctly rounded fused
operations (rounding)."""
