"""Authoring the course: chapters as text notebooks (source, include), their checks on the text (lint,
exercises), the learner's release and the student edition (release, edition), the book (book, figures,
widgets)."""
