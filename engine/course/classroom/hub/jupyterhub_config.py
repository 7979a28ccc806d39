"""JupyterHub for the class (make hub): local addresses, the shared course install, the roster's accounts.

Run by root from the shared install: `$HUB_PREFIX/bin/jupyterhub -f $HUB_PREFIX/src/engine/course/classroom/hub/
jupyterhub_config.py`. Each account's JupyterLab is that install's jupyterhub-singleuser, started as the
account (JupyterHub's LocalProcessSpawner), so every account must be able to run it (setup.sh). Settings
come from the environment:

- HUB_PREFIX   the shared install (default: the Python running the hub);
- HUB_ROSTER   the class's roster file: its students and instructors may log in, the instructors are
               the hub's admins (no roster: any local account may log in);
- HUB_PORT     the address is http://127.0.0.1:HUB_PORT (default 8000); the hub and the proxy's API
               take the next two ports;
- HUB_STATE    where the hub keeps its database, cookie secret and proxy pid (default /srv/jupyterhub);
- HUB_AUTH     `pam` (default: the accounts' own passwords) or `dummy` with HUB_DUMMY_PASSWORD, one
               shared password, for tests only.
"""
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (JupyterHub provides it)
prefix = Path(os.environ.get("HUB_PREFIX", sys.prefix))
port = int(os.environ.get("HUB_PORT", "8000"))
state = Path(os.environ.get("HUB_STATE", "/srv/jupyterhub"))
state.mkdir(parents=True, exist_ok=True, mode=0o700)

c.JupyterHub.bind_url = f"http://127.0.0.1:{port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = port + 1
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{port + 2}"
c.ConfigurableHTTPProxy.command = [str(prefix / "bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")

INSTRUCTORS_GROUP = "paged-kv-instructors"      # engine/course/classroom/hub/accounts.py


def instructor(name: str) -> bool:
    """Whether the account is in the instructors' group (they read the course's src/; students cannot)."""
    import grp
    import pwd
    try:
        group = grp.getgrnam(INSTRUCTORS_GROUP)
        return name in group.gr_mem or pwd.getpwnam(name).pw_gid == group.gr_gid
    except KeyError:
        return False


# Every account's server: the shared install's, as that account, on 127.0.0.1, opening JupyterLab.
# Students' Python imports the student edition's engine ($HUB_PREFIX/student: engine/course/classroom/hub/
# student_engine.py); the install's commands are first on PATH (its terminals' login shells get them
# again from /etc/profile.d/paged-kv-course.sh).
c.Spawner.cmd = [str(prefix / "bin" / "jupyterhub-singleuser")]
c.Spawner.ip = "127.0.0.1"
c.Spawner.default_url = "/lab"
c.Spawner.environment = {"PATH": f"{prefix / 'bin'}:/usr/local/bin:/usr/bin:/bin",
                         "PYTHONPATH": lambda spawner: "" if instructor(spawner.user.name) else str(prefix / "student"),
                         "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 120

if os.environ.get("HUB_AUTH", "pam") == "dummy":
    c.JupyterHub.authenticator_class = "dummy"
    c.DummyAuthenticator.password = os.environ["HUB_DUMMY_PASSWORD"]

if os.environ.get("HUB_ROSTER"):
    from engine.course.classroom.class_folder import read_roster
    roster = read_roster(Path(os.environ["HUB_ROSTER"]))
    instructors = {person.ident for person in roster.instructors}
    c.Authenticator.allowed_users = instructors | {person.ident for person in roster.students}
    c.Authenticator.admin_users = instructors
else:
    c.Authenticator.allow_all = True
