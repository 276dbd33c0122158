"""`parity models synth`: a random-weights target + EAGLE head of a real shape, calibrated to an acceptance."""
