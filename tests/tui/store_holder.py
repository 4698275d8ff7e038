"""Another process holding the store's lock, for the Dashboard's bad-state tests.

    python tests/tui/store_holder.py STORE immediate|exclusive

`immediate`: a writer stuck inside BEGIN IMMEDIATE (WAL readers still read);
`exclusive`: locking_mode EXCLUSIVE and BEGIN EXCLUSIVE (readers are locked out).
Prints "locked" once it holds the lock, and holds it until stdin closes; then rolls back.
"""

import sqlite3
import sys


def main() -> None:
    path, mode = sys.argv[1], sys.argv[2]
    connection = sqlite3.connect(path, isolation_level=None, timeout=10)
    if mode == "exclusive":
        connection.execute("PRAGMA locking_mode = EXCLUSIVE")
        connection.execute("BEGIN EXCLUSIVE")
    else:
        connection.execute("BEGIN IMMEDIATE")
    connection.execute(
        "INSERT INTO gpu_sample (node_name, gpu_index, time_unix_s) VALUES ('holder', 0, 0)"
    )
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    connection.execute("ROLLBACK")
    connection.close()


if __name__ == "__main__":
    main()
