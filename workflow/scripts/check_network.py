"""Stop the pipeline early, with the reason, if this machine cannot run the chosen network.

    python workflow/scripts/check_network.py DOCTOR.json NETWORK [HOSTFILE]
"""
import json
import sys


def main() -> int:
    report = json.load(open(sys.argv[1]))
    network = sys.argv[2]
    if network == "hostfile":  # real machines: the hostfile must be sound; its nodes go to the log
        from phub.launching.hostfile import load_hostfile
        from phub.errors import ConfigError

        try:
            cluster = load_hostfile(sys.argv[3])
        except (ConfigError, IndexError) as exc:
            print(f"network: hostfile: {exc if str(exc) else 'no hostfile given (config key hostfile)'}",
                  file=sys.stderr)
            return 1
        for node in cluster.servers + cluster.workers:
            print(f"node {node.name} rack {node.rack}: {', '.join(node.addresses)}", file=sys.stderr)
        return 0
    modes = report.get("modes", {})
    mode = modes.get("emulated_rack" if network == "emulated" else "loopback", {})
    if mode.get("available", network == "loopback"):
        return 0
    print(f"network: {network} cannot run here: {mode.get('reason', 'unknown reason')}. "
          "Run as root, or set `network: loopback` (unshaped) in the config.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
