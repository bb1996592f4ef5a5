"""The simulated machine's state: buffers and barriers in memory, blocks and
warpgroups, the discrete-event scheduler, SMEM aliasing, and how the GPU
computes numbers (numerics/). Rules in interpret/rules/ update it; checks/
watch it; timing/ prices it."""
