"""The applications: the ``poskernel`` command and the interactive head view."""
