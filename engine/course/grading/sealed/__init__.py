"""The trust boundary of sealed grading: the host, the judge, the kernel process and the channels between
them (README.md)."""
