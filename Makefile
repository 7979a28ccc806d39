# The course's commands. `make setup` once, then `make test`; learners use `make lab` and `make grade`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
# Tests run with the venv first on PATH so nbgrader/jupyter find the right kernel.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup test test-fast test-lab lab release grade autograde student-edition book book-instructor book-pdf bench tiny-model lock clean help \
	hub-setup hub-accounts hub hub-unlock hub-teardown course class-grade

help:
	@echo "make setup      create .venv and install the pinned environment (idempotent)"
	@echo "make test       run the whole test suite"
	@echo "make lab        open JupyterLab on notebooks/"
	@echo "make grade      grade your notebooks (or: make grade DIR=path)"
	@echo "make release    regenerate notebooks/ (learner edition) from solutions/"
	@echo "make autograde SUBMISSIONS=dir [JOBS=2 | CLUSTER=tcp://host:8786]   instructor: sealed, sandboxed nbgrader autograde + feedback + grades.csv"
	@echo "make student-edition CHAPTERS=ch02,ch03 [UNLOCK=ch02]   instructor: build/student-edition/ to hand out"
	@echo "make course ROSTER=roster.ini   instructor: the course folder and gradebook from a roster (no submission)"
	@echo "make class-grade CHAPTER=ch02 [RELEASE=1]   instructor: collect, grade, feedback, reports (exchange)"
	@echo "make hub-setup  as root: the course installed for every account in $(HUB_PREFIX), for JupyterHub"
	@echo "make hub-accounts ROSTER=roster.ini, make hub ROSTER=roster.ini   as root: the accounts, the hub"
	@echo "make hub-unlock CHAPTER=ch02   instructor: students import ch02's reference (after its due date)"
	@echo "make hub-teardown ROSTER=roster.ini   as root: the class's accounts, exchange folder and hub state removed"
	@echo "make book       build the HTML book into book/_build/html (make book-instructor: with solutions)"
	@echo "make book-pdf   the book as one PDF, book/_build/pdf/book.pdf (needs Chromium)"
	@echo "make test-fast  the suite without notebook execution, book build and browser checks"
	@echo "make test-lab   run every cell of every chapter in JupyterLab in headless Chromium (slow)"
	@echo "make bench      the continuous-batching benchmark (python -m engine bench --help for options)"
	@echo "make tiny-model retrain engine/tiny_model/ from its seed on the CPU (one thread, a few minutes)"

setup: $(STAMP)

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@mkdir -p build && date +%s > build/.setup-started
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt -c constraints.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (paged-kv-course)" >/dev/null
	touch $(STAMP)
	@echo "make setup: done in $$(( $$(date +%s) - $$(cat build/.setup-started) )) s"

# Browser tests need Chromium (engine/course/authoring/book.py finds it); without it they skip, and say so here.
CHROMIUM_CHECK = $(PY) -c "from engine.course.authoring.book import chromium_executable as c, CHROMIUM_HINT as h; \
	c() or print('make test: browser tests will skip: ' + h)"

test: setup
	@$(CHROMIUM_CHECK)
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=12

# Every cell of every chapter in JupyterLab (make test runs them for chapter 2 only); CI runs this too.
test-lab: setup
	LAB_CHAPTERS=all $(PY) -m pytest -q tests/test_lab_notebooks.py

test-fast: setup
	$(PY) -m pytest -n 2 --dist loadfile -q -m "not slow and not browser"

# JupyterLab on notebooks/ (LAB_DIR, LAB_ARGS, LAB_LOG: used by tests/test_lab_notebooks.py). As root
# (containers, cloud machines) it adds --allow-root. The learner's lab has no nbgrader instructor menus and
# no news pop-up (engine/course/learner_lab/, first on JUPYTER_CONFIG_PATH for this lab only); jupyter's
# log goes to LAB_LOG, and the address to open, with its token, is the last line printed.
LAB_DIR ?= notebooks
LAB_ARGS ?=
LAB_LOG ?= build/lab.log
LAB_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)
lab: setup
	@echo "make lab: JupyterLab on $(LAB_DIR)/ (its log: $(LAB_LOG); Ctrl-C stops it)"
	@mkdir -p "$(dir $(LAB_LOG))"; : >"$(LAB_LOG)"; \
	JUPYTER_CONFIG_PATH="$(abspath engine/course/learner_lab)$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	  $(BIN)/jupyter lab "$(LAB_DIR)" $(LAB_ROOT) $(LAB_ARGS) >"$(LAB_LOG)" 2>&1 </dev/null & lab=$$!; \
	trap 'kill $$lab 2>/dev/null; wait $$lab; exit 0' INT TERM; \
	until grep -qE 'https?://[^ ]+/lab\?token=' "$(LAB_LOG)" || ! kill -0 $$lab 2>/dev/null; do sleep 0.3; done; \
	address=$$(grep -oE 'http://(127\.0\.0\.1|localhost)[^ ]*/lab\?token=[^ ]*' "$(LAB_LOG)" | tail -1); \
	if [ -z "$$address" ]; then tail -n 30 "$(LAB_LOG)"; echo "make lab: JupyterLab did not start (log: $(LAB_LOG))"; exit 1; fi; \
	echo "Open this address in your browser:"; echo "$$address"; \
	wait $$lab

release: setup
	$(PY) -m engine.course.authoring.release

DIR ?= notebooks
grade: setup
	$(PY) -m engine.course.grading.grade "$(DIR)"

SUBMISSIONS ?= submissions
JOBS ?= 2
SANDBOX ?= required
autograde: setup
	$(PY) -m engine.course.grading.autograde "$(SUBMISSIONS)" --jobs "$(JOBS)" --sandbox "$(SANDBOX)" \
		$(if $(CLUSTER),--cluster "$(CLUSTER)")

# A class through nbgrader's exchange (engine/course/classroom/class_folder.py): the course folder from a roster
# (engine/course/classroom/hub/roster.example.ini), then one round of grading per chapter after students submit.
ROSTER ?= roster.ini
COURSE ?= course
CHAPTER ?=
RELEASE ?=
course: setup
	$(PY) -m engine.course.classroom.class_folder prepare --roster "$(ROSTER)" --course "$(COURSE)"

class-grade: setup
	$(PY) -m engine.course.classroom.class_folder grade "$(CHAPTER)" --course "$(COURSE)" --jobs "$(JOBS)" \
	  --sandbox "$(SANDBOX)" $(if $(RELEASE),--release)

# JupyterHub for the class (engine/course/classroom/hub/, as root): the install every account can run, the
# roster's accounts, the hub on http://127.0.0.1:$(HUB_PORT).
HUB_PREFIX ?= /opt/paged-kv-course
HUB_PORT ?= 8000
hub-setup: setup
	HUB_PREFIX="$(HUB_PREFIX)" bash engine/course/classroom/hub/setup.sh

hub-accounts:
	$(HUB_PREFIX)/bin/python -m engine.course.classroom.hub.accounts --roster "$(ROSTER)"

hub:
	HUB_PREFIX="$(HUB_PREFIX)" HUB_ROSTER="$(abspath $(ROSTER))" HUB_PORT="$(HUB_PORT)" \
	  $(HUB_PREFIX)/bin/jupyterhub -f $(HUB_PREFIX)/src/engine/course/classroom/hub/jupyterhub_config.py

# As an instructor, after CHAPTER's due date: the student engine keeps its reference from now on.
hub-unlock:
	$(HUB_PREFIX)/bin/python -m engine.course.classroom.hub.student_engine --unlock "$(CHAPTER)" --course "$(COURSE)"

HUB_STATE ?= /srv/jupyterhub
hub-teardown:
	$(HUB_PREFIX)/bin/python -m engine.course.classroom.hub.accounts --roster "$(ROSTER)" --remove --hub-state "$(HUB_STATE)"

# What an instructor hands out: the chapters named, an engine stubbed for every chapter not unlocked.
CHAPTERS ?=
UNLOCK ?=
student-edition: setup
	$(PY) -m engine.course.authoring.edition --chapters "$(CHAPTERS)" --unlock "$(UNLOCK)"

book: setup
	$(PY) -m engine.course.authoring.book

book-instructor: setup
	$(PY) -m engine.course.authoring.book --instructor

book-pdf: setup
	$(PY) -m engine.course.authoring.book --pdf

bench: setup
	$(PY) -m engine bench

# The tiny Qwen3 the engine writes text with, retrained from its seed on engine/tiny_model/corpus.txt:
# deterministic, one CPU thread (slower while other work shares the machine); tests/test_tiny_model.py
# checks the result against engine/tiny_model/training.json.
tiny-model: setup
	$(PY) -m engine.tools.train_tiny

# On a GPU machine (no setup: it may have no network): compiled kernel tests, decode bandwidth, the engine
# on CUDA, every chapter notebook; one JSON, OUT=file or folder (default $$OUT/ or build/gpu_check.json).
.PHONY: gpu-check
gpu-check:
	bash engine/tools/gpu_check.sh $(if $(OUT),"$(OUT)")

# Re-resolve constraints.txt from requirements.txt (needs the registry).
lock:
	rm -rf /tmp/pkv-lock && $(PYTHON) -m venv /tmp/pkv-lock
	/tmp/pkv-lock/bin/pip install -q -r requirements.txt
	{ echo "# The resolved environment (pip freeze on Linux, Python 3.11), used as constraints by make setup."; \
	  echo "# Regenerate: make lock"; \
	  /tmp/pkv-lock/bin/pip freeze | grep -v -i -E "^(torch|triton)=="; } > constraints.txt

clean:
	rm -rf book/_build .pytest_cache build/host-engines
