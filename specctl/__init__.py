"""specctl: speculative decoding across unequal GPU machines."""
