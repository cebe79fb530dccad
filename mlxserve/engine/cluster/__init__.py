"""One model over several machines: the ranks step in lockstep (mlx.distributed), and rank 0
wakes the others through a doorbell."""
