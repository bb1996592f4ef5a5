"""Which blocks a launch must simulate: the classes of blocks that cannot
differ (block_classes.py) and, for ps.estimate, each block's path through the
slice of the kernel its control decisions need (paths.py, which runs that
slice with the interpreter)."""
