"""Stop the pipeline early, with the reason, if this machine cannot run the chosen network.

    python workflow/scripts/check_network.py DOCTOR.json NETWORK
"""
import json
import sys


def main() -> int:
    report = json.load(open(sys.argv[1]))
    network = sys.argv[2]
    modes = report.get("modes", {})
    mode = modes.get("emulated_rack" if network == "emulated" else "loopback", {})
    if mode.get("available", network == "loopback"):
        return 0
    print(f"network: {network} cannot run here: {mode.get('reason', 'unknown reason')}. "
          "Run as root, or set `network: loopback` (unshaped) in the config.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
