"""The shift-invariant fit and what is read from it: the Toeplitz fit from sufficient
statistics, the fit by bands of offsets and the kind of kernel a head implements."""
