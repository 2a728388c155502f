"""Running Ansible: the playbooks through ansible-runner, and the control node's wheel downloads."""
