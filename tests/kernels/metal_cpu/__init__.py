"""The generated Metal sources compiled as C++ against a stand-in for <metal_stdlib> and run on the CPU (README.md)."""
