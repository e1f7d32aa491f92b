"""What a process attached to a running store uses to read: consumers, rebalance, offsets."""
