"""What the grader reads from the cells' text, and only from it: the names a cell binds and reads
(names), whether a graded name is the learner's own def or class and whether it is written yet
(decide), copies of the reference (likeness), and a kernel's def (kernels). Nothing here runs or
imports learner code; the processes that do are in sealed/."""
