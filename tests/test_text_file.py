"""dflash.provision.text_file, the roles' writer of managed text files in one round trip: the module run as
Ansible's module debugging runs one (on temporary trees of this machine), and the action plugin through
ansible-playbook on the control node (src read there, check and diff mode). tests/test_stack.py proves the
roles' drift correction with it on sandbox hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import COLLECTIONS, ROOT, run_module

MODULE = "ansible_collections/dflash/provision/plugins/modules/text_file.py"
BIN = Path(sys.executable).parent


def text_file(tmp: Path, check: bool = False, diff: bool = False, **args: object) -> dict:
    return run_module(MODULE, {**args, "_ansible_check_mode": check, "_ansible_diff": diff}, tmp)


def mode(path: Path) -> str:
    return f"{path.stat().st_mode & 0o7777:04o}"


# any text, control characters and non-ASCII included: the bytes on disk are its UTF-8, and a second run
# finds nothing to do
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.text(), new_mode=st.sampled_from(["0600", "0640", "0644", "0755"]))
def test_writes_the_content_then_finds_it_as_planned(tmp_path: Path, content: str, new_mode: str) -> None:
    dest = tmp_path / "managed.txt"
    dest.unlink(missing_ok=True)
    first = text_file(tmp_path, dest=str(dest), content=content, mode=new_mode)
    assert first["changed"] is True, first
    assert dest.read_bytes() == content.encode("utf-8") and mode(dest) == new_mode
    again = text_file(tmp_path, dest=str(dest), content=content, mode=new_mode)
    assert again["changed"] is False, again


def test_content_owner_and_mode_drift_are_put_back_and_a_link_is_replaced(tmp_path: Path) -> None:
    dest = tmp_path / "env"
    dest.write_text("A=1\n# drift\n")
    dest.chmod(0o666)
    fixed = text_file(tmp_path, dest=str(dest), content="A=1\n", mode="0644", diff=True)
    assert fixed["changed"] is True and dest.read_text() == "A=1\n" and mode(dest) == "0644"
    content_diff, attribute_diff = fixed["diff"]
    assert content_diff["before"] == "A=1\n# drift\n" and content_diff["after"] == "A=1\n"
    assert attribute_diff["before"]["mode"] == "0666" and attribute_diff["after"]["mode"] == "0644"
    # only the mode drifted: the content is left, the mode put back
    dest.chmod(0o600)
    inode = dest.stat().st_ino
    assert text_file(tmp_path, dest=str(dest), content="A=1\n", mode="0644")["changed"] is True
    assert mode(dest) == "0644" and dest.stat().st_ino == inode
    target = tmp_path / "elsewhere"
    target.write_text("A=1\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert text_file(tmp_path, dest=str(link), content="A=1\n", mode="0644")["changed"] is True
    assert not link.is_symlink() and target.read_text() == "A=1\n"


def test_check_mode_reports_and_changes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "new.txt"
    dry = text_file(tmp_path, check=True, diff=True, dest=str(dest), content="x\n", mode="0644")
    assert dry["changed"] is True and not dest.exists() and dry["diff"][0]["after"] == "x\n"
    dest.write_text("y\n")
    dest.chmod(0o600)
    dry = text_file(tmp_path, check=True, dest=str(dest), content="x\n", mode="0644")
    assert dry["changed"] is True and dest.read_text() == "y\n" and mode(dest) == "0600"


def test_refuses_a_directory_and_a_missing_directory(tmp_path: Path) -> None:
    answer = text_file(tmp_path, dest=str(tmp_path), content="x", mode="0644")
    assert answer.get("failed") and "is a directory" in answer["msg"]
    answer = text_file(tmp_path, dest=str(tmp_path / "no" / "file"), content="x", mode="0644")
    assert answer.get("failed") and "does not exist" in answer["msg"]


def test_the_action_reads_src_on_the_control_node_in_check_diff_and_real_runs(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "script.py").write_text("print('placed')\n")
    dest = tmp_path / "out" / "script.py"
    dest.parent.mkdir()
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - dflash.provision.text_file: {{src: script.py, dest: {dest}, mode: '0640'}}\n"
    )

    def play(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
             "-e", f"ansible_python_interpreter={sys.executable}", *flags, str(playbook)],
            # a host list (-i localhost,): provision itself, once imported in this process, allows YAML inventories only
            env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                 "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_INVENTORY_ENABLED": "host_list"},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    dry = play("--check", "--diff")
    assert dry.returncode == 0 and "+print('placed')" in dry.stdout and "changed=1" in dry.stdout, dry.stdout
    assert not dest.exists()
    assert "changed=1" in play().stdout and dest.read_text() == "print('placed')\n" and mode(dest) == "0640"
    assert "changed=0" in play().stdout
    both = playbook.read_text().replace("src: script.py", "src: script.py, content: x")
    playbook.write_text(both)
    refused = play()
    assert refused.returncode != 0 and "exactly one of src and content" in refused.stdout
