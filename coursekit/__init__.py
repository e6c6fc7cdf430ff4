"""The course's public toolkit: measuring helpers that the book, the students
and the grader all use (peak memory of a call, PyTorch tensor memory, where
Triton kernels run, what a Triton kernel loads and stores, and what Triton's
compiler makes of a kernel for real GPUs, without one).

Public side of the course: it ships in the student release. Nothing here
holds an answer or a test."""
