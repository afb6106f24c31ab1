"""The run directory: its layout, durable writes, bounded reads, the loss and eval logs."""
