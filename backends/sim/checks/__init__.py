"""What the simulator finds while blocks run: happens-before (observer), races
within a group (races) and between blocks (cross_block), and uninitialized
memory (initcheck)."""
