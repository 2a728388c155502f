"""Several hosts that form one serving instance."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

TWO_NODES = {
    "all": {
        "vars": {"ansible_connection": "local"},
        "children": {
            "b300": {
                "hosts": {"node-a": {"ansible_host": "127.0.0.1"}, "node-b": {"ansible_host": "127.0.0.2"}},
                "vars": {"dflash_multinode": {"nodes": ["node-a", "node-b"], "init_port": 51000}},
            }
        },
    }
}


def _two_nodes(inventory: Path, **group_vars: object) -> None:
    doc = json.loads(json.dumps(TWO_NODES))
    doc["all"]["children"]["b300"]["vars"].update(group_vars)
    (inventory / "hosts.yml").write_text(yaml.safe_dump(doc))


def test_node_ranks_follow_the_node_list(inventory: Path, run) -> None:
    _two_nodes(inventory, dflash_set={"serve.tp": 16})
    rc, out, err = run("plan", "--json", "--host", "b300", "--inventory", str(inventory))
    assert rc == 0, err
    hosts = json.loads(out)["hosts"]
    for rank, name in enumerate(["node-a", "node-b"]):
        plan = hosts[name]
        assert plan["multinode"] == {"nnodes": 2, "node_rank": rank, "dist_init_addr": "127.0.0.1:51000"}
        joined = " ".join(plan["argv"])
        assert f"--nnodes 2 --node-rank {rank} --dist-init-addr 127.0.0.1:51000" in joined
        assert "--tp-size 16" in joined


def test_tp_beyond_all_nodes_is_refused(inventory: Path, run) -> None:
    _two_nodes(inventory, dflash_set={"serve.tp": 32})
    rc, _, err = run("plan", "--host", "b300", "--inventory", str(inventory))
    assert rc == 2 and "needs more GPUs than 16 (8 per node x 2 nodes)" in err


def test_node_not_in_inventory_is_refused(inventory: Path, run) -> None:
    _two_nodes(inventory, dflash_multinode={"nodes": ["node-a", "node-c"]})
    rc, _, err = run("plan", "--host", "node-a", "--inventory", str(inventory))
    assert rc == 2 and "dflash_multinode.nodes" in err and "not in the inventory: node-c" in err


def test_host_outside_its_instance_is_refused(inventory: Path, run) -> None:
    _two_nodes(inventory, dflash_multinode={"nodes": ["node-a", "node-a"]})
    rc, _, err = run("plan", "--host", "node-b", "--inventory", str(inventory))
    assert rc == 2 and "each node may appear once" in err


def test_nodes_of_one_instance_must_agree(inventory: Path, run) -> None:
    _two_nodes(inventory)
    host_vars = inventory / "host_vars"
    host_vars.mkdir()
    (host_vars / "node-b.yml").write_text("dflash_set:\n  serve.port: 30001\n")
    rc, _, err = run("plan", "--host", "b300", "--inventory", str(inventory))
    assert rc == 2 and "node-a and node-b are nodes of one instance but their multinode or serve settings differ" in err


def test_an_instance_mixing_host_types_is_refused(inventory: Path, run) -> None:
    doc = json.loads(json.dumps(TWO_NODES))
    b300 = doc["all"]["children"]["b300"]
    b300["hosts"].pop("node-b")
    doc["all"]["children"]["rtx6000"] = {"hosts": {"node-b": {"ansible_host": "127.0.0.2"}}, "vars": b300["vars"]}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(doc))
    rc, out, err = run("plan", "--host", "node-a", "--inventory", str(inventory))
    assert rc == 2 and out == "" and "dflash_multinode.nodes" in err, err
    assert "one instance spans one host type; got node-a (b300), node-b (rtx6000)" in err


def test_an_ipv6_init_address_is_refused(inventory: Path, run) -> None:
    _two_nodes(inventory, dflash_multinode={"nodes": ["node-a", "node-b"], "init_addr": "fd00::1"})
    rc, _, err = run("plan", "--host", "node-a", "--inventory", str(inventory))
    assert rc == 2 and "multinode.init_addr" in err and "IPv6" in err


def test_a_multinode_unit_opens_the_rdma_devices(inventory: Path, run) -> None:
    _two_nodes(inventory, dflash_set={"serve.tp": 16})
    rc, out, err = run("plan", "--json", "--host", "node-a", "--inventory", str(inventory))
    assert rc == 0, err
    unit = json.loads(out)["unit"]
    assert "DeviceAllow=char-infiniband_verbs rw" in unit and "DeviceAllow=/dev/infiniband/rdma_cm rw" in unit
    assert "LimitMEMLOCK=infinity" in unit
