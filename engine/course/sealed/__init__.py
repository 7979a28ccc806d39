"""Pieces of the sealed grading worker that stand on their own (engine.course.seal uses them)."""
