"""The class's JupyterHub: setup.sh (the shared install), jupyterhub_config.py, accounts.py (see README.md)."""
