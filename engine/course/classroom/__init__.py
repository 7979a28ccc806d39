"""Running a class: the class folder and its roster (class_folder), collecting submissions (inbound),
reports and grade exports (reports, export), and the JupyterHub install (hub/)."""
