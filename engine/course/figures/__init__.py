"""Plotting helpers of the chapters: the figure code lives here, so a chapter page shows the call and the picture."""
