#!/usr/bin/env bash
# make hub-setup: the course installed where every account on the machine can run it, for a JupyterHub
# class. As root. HUB_PREFIX (default /opt/paged-kv-course) gets a virtual environment on a Python every
# account can read (HUB_PYTHON, default /usr/bin/python3), a copy of this course in $HUB_PREFIX/src (so
# students need nothing of this checkout), the pinned packages with JupyterHub, configurable-http-proxy
# from npm, nbgrader's extensions set for students (the instructor's are turned on per account by
# accounts.py), the exchange folder and the site's nbgrader configuration. Idempotent: run it again
# after updating the checkout. `setup.sh --sources` copies the course's files only (the packages as they
# are: the course is installed editable from $HUB_PREFIX/src).
#
# What students may not have: $HUB_PREFIX/src (solutions/, tests/, the full engine, the grader's host
# engines) is readable by root and the instructors' group (paged-kv-instructors) only; students import
# the student edition's engine in $HUB_PREFIX/student (engine/course/classroom/hub/student_engine.py), through
# PYTHONPATH (/etc/profile.d/paged-kv-course.sh for shells, jupyterhub_config.py for JupyterLab), which
# also puts the install's commands on every account's PATH. The exchange is sticky (1777). The grading
# cgroups (memory, pids: paged-kv-grading, cgroup v1) are the instructors' group's, so the sandbox's
# limits hold when an instructor grades; they go at a reboot: `setup.sh --cgroups` makes them again.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../../.." && pwd)
prefix=${HUB_PREFIX:-/opt/paged-kv-course}
# The Python the pins were resolved on: the one `make setup` built .venv from, unless HUB_PYTHON names one.
python=${HUB_PYTHON:-$("$repo/.venv/bin/python" -c 'import sys; print(sys.base_prefix)' 2>/dev/null)/bin/python3}
exchange=${HUB_EXCHANGE:-/srv/nbgrader/exchange}
group=paged-kv-instructors      # engine/course/classroom/hub/accounts.py adds the roster's instructors to it
proxy_version=5.3.0
die() { echo "hub-setup: $*" >&2; exit 2; }
step() { echo "hub-setup: $* ($(( SECONDS - start )) s)"; }
start=$SECONDS
cd /          # no `python -c` below may import the checkout's engine/ instead of the install's

# The course itself, copied (step 2): this checkout's files, its venv, builds and courses left out.
copy_sources() {
  rm -rf "$prefix/src.new" && mkdir -p "$prefix/src.new"
  tar -C "$repo" --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./course --exclude=./book/_build \
      --exclude='__pycache__' --exclude=.pytest_cache --exclude=.hypothesis --exclude='*.egg-info' -cf - . \
    | tar -C "$prefix/src.new" -xf -
  rm -rf "$prefix/src" && mv "$prefix/src.new" "$prefix/src"
  if [ -x "$prefix/bin/python" ] && "$prefix/bin/python" -c "import engine" 2>/dev/null; then
    host_engines
    student_engine
  fi
  lock_sources
  step "course copied to $prefix/src (the instructors' only), the student engine in $prefix/student"
}
# src/ the instructors' group's only. The grader's host engines stay readable for the sandbox's nobody
# (a root grader drops to it), in folders named by a digest of the sources, in folders no one else lists.
lock_sources() {
  chown -R "root:$group" "$prefix/src"
  chmod -R u=rwX,g=rX,o= "$prefix/src"
  chmod o=x "$prefix/src"
  if [ -d "$prefix/src/build/host-engines" ]; then
    chmod o=x "$prefix/src/build" "$prefix/src/build/host-engines"
    find "$prefix/src/build/host-engines" -mindepth 1 -maxdepth 1 -exec chmod -R o=rX {} +
  fi
}
# The engine students import (the chapters unlocked so far stay unlocked), rebuilt by root here.
student_engine() {
  mkdir -p "$prefix/student" && chown "root:$group" "$prefix/student" && chmod 2775 "$prefix/student"
  "$prefix/bin/python" -m engine.course.classroom.hub.student_engine --force --out "$prefix/student" \
    --unlock "$(cat "$prefix/student/UNLOCKED" 2>/dev/null | tr '\n' ' ')" >/dev/null
  chgrp -R "$group" "$prefix/student"
}
# The grading cgroups the instructors' group may make a submission's cgroup in (cgroup v1; on v2 the
# sandbox can only move a process between cgroups below one the account already runs in).
grading_cgroups() {
  local made=""
  for controller in memory pids; do
    local root=/sys/fs/cgroup/$controller
    if [ -f "$root/cgroup.procs" ] && mkdir -p "$root/paged-kv-grading" 2>/dev/null; then
      chgrp "$group" "$root/paged-kv-grading" && chmod 2775 "$root/paged-kv-grading" && made="$made $controller"
    fi
  done
  step "grading cgroups for $group:${made:- none (no cgroup v1 memory/pids hierarchy: per-process limits only)}"
}
# Every account's login shell: the install's commands on PATH; students import the student engine.
profile() {
  cat >/etc/profile.d/paged-kv-course.sh <<PROFILE
# The paged-KV course's install (engine/course/classroom/hub/setup.sh): its commands, and students' engine.
case ":\$PATH:" in *":$prefix/bin:"*) ;; *) PATH="$prefix/bin:\$PATH"; export PATH ;; esac
if ! id -Gn 2>/dev/null | tr ' ' '\n' | grep -qx "$group" && [ "\$(id -u)" != 0 ]; then
  PYTHONPATH="$prefix/student"; export PYTHONPATH
fi
PROFILE
  chmod 644 /etc/profile.d/paged-kv-course.sh
}
# The engines the grader's host imports, one per chapter (engine/course/authoring/edition.py), built here as root: an
# instructor's account cannot write in $prefix, and no account may plant one there.
host_engines() {
  "$prefix/bin/python" -c "from engine.course.authoring.edition import host_engine; from engine.course.paths import chapter_files
for chapter in chapter_files(): host_engine(chapter)"
}
if [ "${1:-}" = "--sources" ]; then
  [ -x "$prefix/bin/jupyterhub" ] || die "no course install in $prefix yet: run it without --sources first"
  copy_sources
  exit 0
fi
if [ "${1:-}" = "--cgroups" ]; then grading_cgroups; exit 0; fi


[ "$(id -u)" -eq 0 ] || die "run it as root: it writes $prefix and $exchange, and the hub starts each account's server"
command -v npm >/dev/null || die "needs npm for configurable-http-proxy: apt-get install npm"
[ -x "$python" ] || die "no Python at $python: run make setup first, or set HUB_PYTHON"
getent group "$group" >/dev/null || groupadd --system "$group"
# 1. A Python every account can run: a venv links to its interpreter, so that one must be readable by all.
# One that is not (pyenv's or conda's under /root) is copied into $prefix/python, its standard library
# with it (not its site-packages), and its library path made relative with patchelf.
if ! runuser -u nobody -- "$python" -c "import venv, ensurepip" 2>/dev/null; then
  base=$("$python" -c 'import sys; print(sys.base_prefix)')
  version=$("$python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
  if [ ! -x "$prefix/python/bin/$version" ]; then
    command -v patchelf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >/dev/null; } \
      || die "needs patchelf to copy $python for every account: apt-get install patchelf"
    rm -rf "$prefix/python.new" && mkdir -p "$prefix/python.new"
    tar -C "$base" --exclude="./lib/$version/site-packages" --exclude="./lib/$version/test" \
        --exclude='__pycache__' -cf - . | tar -C "$prefix/python.new" -xf -
    mkdir -p "$prefix/python.new/lib/$version/site-packages"
    for binary in "$prefix/python.new/bin/$version" "$prefix/python.new/lib/$version"/lib-dynload/*.so; do
      if patchelf --print-rpath "$binary" 2>/dev/null | grep -q "$base"; then
        patchelf --set-rpath "\$ORIGIN/../lib" "$binary"
      fi
    done
    rm -rf "$prefix/python" && mv "$prefix/python.new" "$prefix/python"
    chmod -R a+rX "$prefix/python"
  fi
  python="$prefix/python/bin/$version"
  runuser -u nobody -- "$python" -c "import venv, ensurepip, ssl, sqlite3" \
    || die "the copy of Python in $prefix/python does not run for every account"
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$python is older than 3.10"
[ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix"
step "environment $prefix on $("$prefix/bin/python" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
copy_sources

# 3. The pinned packages (jupyterhub among them, for jupyterhub-singleuser) and the course, its kernel.
"$prefix/bin/python" -m pip install --disable-pip-version-check -q -r "$prefix/src/requirements.txt" \
  -c "$prefix/src/constraints.txt"
"$prefix/bin/python" -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e "$prefix/src"
"$prefix/bin/python" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (paged-kv-course)" >/dev/null
host_engines
student_engine
lock_sources
step "packages installed, the grader's host engines and the student engine built"

# 4. nbgrader for students: the assignment list (fetch, submit, feedback) and validate; formgrader, the
# course list and "Create Assignment" off (accounts.py turns them on for each instructor, in their home).
jupyter() { "$prefix/bin/jupyter" "$@" >/dev/null 2>&1; }
jupyter server extension enable --sys-prefix nbgrader.server_extensions.assignment_list
jupyter server extension enable --sys-prefix nbgrader.server_extensions.validate_assignment
jupyter server extension disable --sys-prefix nbgrader.server_extensions.formgrader
jupyter server extension disable --sys-prefix nbgrader.server_extensions.course_list
jupyter labextension enable --level=sys_prefix @jupyter/nbgrader:assignment-list
jupyter labextension enable --level=sys_prefix @jupyter/nbgrader:validate-assignment
for name in formgrader course-list create-assignment; do
  jupyter labextension disable --level=sys_prefix "@jupyter/nbgrader:$name"
done
jupyter labextension disable --level=sys_prefix @jupyterlab/apputils-extension:announcements

# 5. configurable-http-proxy, JupyterHub's proxy, from npm.
if [ "$("$prefix/node/node_modules/.bin/configurable-http-proxy" --version 2>/dev/null)" != "$proxy_version" ]; then
  npm install --prefix "$prefix/node" --no-audit --no-fund --loglevel=error "configurable-http-proxy@$proxy_version" >/dev/null
fi
ln -sf ../node/node_modules/.bin/configurable-http-proxy "$prefix/bin/configurable-http-proxy"
step "configurable-http-proxy $proxy_version"

# 6. The exchange (everyone writes to it; nbgrader sets each course's own permissions inside) and the
# site's nbgrader configuration, read by every account's nbgrader.
mkdir -p "$exchange" && chmod 1777 "$exchange"    # sticky: no account renames another's folder
mkdir -p "$prefix/etc/jupyter"
cat >"$prefix/etc/jupyter/nbgrader_config.py" <<CONFIG
"""The site's nbgrader configuration (engine/course/classroom/hub/setup.sh): every account's nbgrader reads it."""
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "paged-kv-course"
c.Exchange.root = "$exchange"
CONFIG
find "$prefix" -path "$prefix/src" -prune -o -exec chmod a+rX {} +
profile
grading_cgroups

# 7. Proof: an account with no rights can run the single-user server and import the course.
runuser -u nobody -- "$prefix/bin/jupyterhub-singleuser" --version >/dev/null \
  || die "an ordinary account cannot run $prefix/bin/jupyterhub-singleuser"
runuser -u nobody -- env PYTHONPATH="$prefix/student" "$prefix/bin/python" -c "import engine.checks, engine._edition, nbgrader, torch" \
  || die "an ordinary account cannot import the student engine from $prefix/student"
! runuser -u nobody -- cat "$prefix/src/solutions/"*.py >/dev/null 2>&1 \
  || die "an ordinary account can read $prefix/src/solutions"
step "done: $prefix (jupyterhub $("$prefix/bin/jupyterhub" --version), exchange $exchange)"
