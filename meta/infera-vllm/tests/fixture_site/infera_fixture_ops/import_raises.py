raise ImportError("libinfera_kernels.so: cannot open shared object file")
