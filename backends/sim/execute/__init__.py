"""Running a launch: the executor and its pieces (prepare, buffers, the block
classes it simulates, merge, clock), a group of blocks on one scheduler
(group), the events a group hands the merge (events), worker processes
(parallel) and Ray (ray_engine), progress and Ctrl-C (progress), and the
developer's estimate check (estimate_check)."""
