"""The only reader of `.pt` files: an allow-listed unpickler over the zip container, no torch."""
