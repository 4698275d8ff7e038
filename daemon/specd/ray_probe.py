"""Run as `python -m daemon.specd.ray_probe ADDRESS`: connect to the Ray cluster as a driver
and print its nodes as JSON on stdout. specd runs it in a subprocess (with a timeout and the
token in that process's environment only) so the daemon never hosts a Ray driver itself."""

import json
import sys


def main() -> None:
    import ray

    ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
    try:
        nodes = [
            {
                "node_id": node["NodeID"],
                "address": node["NodeManagerAddress"],
                "alive": bool(node["Alive"]),
                "labels": node.get("Labels", {}),
                "resources": node.get("Resources", {}),
            }
            for node in ray.nodes()
        ]
    finally:
        ray.shutdown()
    sys.stdout.write(json.dumps({"nodes": nodes}) + "\n")


if __name__ == "__main__":
    main()
