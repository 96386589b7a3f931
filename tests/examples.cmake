# Examples (examples/): one smoke test each; filled in below.
