"""A SIMT evaluator of the Mosaic GPU IR that plgpu.inline_mgpu bodies build."""
