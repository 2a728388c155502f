#!/usr/bin/python
# A managed text file in one round trip: the builtin copy takes up to five for one file (stat, a temporary
# directory, the transfer, the copy, the cleanup), and a drifted file is the common re-apply.

from __future__ import annotations

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native, to_text

DOCUMENTATION = r"""
module: text_file
short_description: Write a text file of the given content, owner, group and mode, in one round trip
description:
  - Compares the file's bytes with I(content) and writes it atomically where they differ (a temporary file in
    the same directory, then a rename), then sets owner, group and mode where they differ, as the builtin
    M(ansible.builtin.copy) does for I(content).
  - The action plugin reads I(src) on the control node (a role's C(files/), or an absolute path) and passes it
    as I(content), so the host is reached once.
  - A symbolic link at I(dest) is replaced by the file, as copy does; a directory there fails.
  - Supports check mode and diff mode (the content's diff, and the owner, group and mode).
options:
  dest:
    description: The file on the host. Its directory must exist.
    type: path
    required: true
  content:
    description: The file's text (UTF-8). Exactly one of I(content) and I(src).
    type: str
  src:
    description: A UTF-8 file on the control node whose text is the content (read by the action plugin).
    type: str
extends_documentation_fragment: [ansible.builtin.files]
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Ship a helper script
  dflash.provision.text_file:
    src: triton_aot.py
    dest: /opt/dflash-provision/libexec/triton_aot.py
    owner: root
    group: root
    mode: "0644"
"""

RETURN = r"""
dest:
  description: The file written or found as planned.
  type: str
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        # src is the action plugin's: it arrives here as content
        argument_spec={"dest": {"type": "path", "required": True}, "content": {"type": "str"}, "src": {"type": "str"}},
        mutually_exclusive=[("content", "src")],
        required_one_of=[("content",)],
        add_file_common_args=True,
        supports_check_mode=True,
    )
    # a new file is created root-only and gets its mode below: never readable by others in between
    os.umask(0o077)
    dest = module.params["dest"]
    b_dest = to_bytes(dest, errors="surrogate_or_strict")
    data = to_bytes(module.params["content"], errors="surrogate_or_strict")
    if os.path.isdir(b_dest) and not os.path.islink(b_dest):
        module.fail_json(msg=f"{dest} is a directory, not a file")
    current = None
    if os.path.isfile(b_dest) and not os.path.islink(b_dest):
        with open(b_dest, "rb") as handle:
            current = handle.read()
    changed = current != data
    diffs = []
    if module._diff and changed:
        diffs.append(
            {
                "before_header": dest,
                "after_header": dest,
                "before": to_text(current or b"", errors="surrogate_or_replace"),
                "after": module.params["content"],
            }
        )
    if changed and not module.check_mode:
        directory = os.path.dirname(b_dest)
        if not os.path.isdir(directory):
            module.fail_json(msg=f"the directory of {dest} does not exist")
        handle, b_tmp = tempfile.mkstemp(dir=directory, prefix=b"." + os.path.basename(b_dest) + b".")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            module.atomic_move(b_tmp, b_dest, unsafe_writes=module.params["unsafe_writes"])
        except OSError as err:
            module.fail_json(msg=f"writing {dest}: {to_native(err)}")
        finally:
            if os.path.exists(b_tmp):
                os.unlink(b_tmp)
    # a new file exists only outside check mode: there is nothing to compare its attributes with in a dry run
    if os.path.lexists(b_dest) or not module.check_mode:
        attributes = {"before": {"path": dest}, "after": {"path": dest}}
        file_args = module.load_file_common_arguments(module.params, path=dest)
        changed = module.set_fs_attributes_if_different(file_args, changed, diff=attributes)
        if module._diff and attributes["before"] != attributes["after"]:
            diffs.append(attributes)
    module.exit_json(changed=changed, dest=dest, diff=diffs)


if __name__ == "__main__":
    main()
