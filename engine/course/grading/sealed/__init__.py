"""The trust boundary of sealed grading: the host, the judge, the channel between them and what the
judge decides (README.md)."""
