"""Reading an Ansible inventory safely, with Ansible's own API."""
