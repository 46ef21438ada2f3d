#!/usr/bin/env python3
"""Forward loopback TCP ports from another network namespace to this one's loopback.

tests/cluster/start.sh runs it for each extra node of a three-node cluster: the node's
containerd pulls from 127.0.0.1:PORT as node 1's does (the same image references, the same
registry hosts), and each connection it makes is carried to the registry listening on the
cluster namespace's 127.0.0.1:PORT. Nothing but loopback on either side.

Usage: forward.py NETNS_PATH PORT...   (run inside the namespace that has the servers)
Prints "forwarding PORT..." on stdout once every port listens in NETNS_PATH.
"""

import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000
libc = ctypes.CDLL(None, use_errno=True)


def enter(fd):
    # Only the calling thread moves; no other thread exists yet when this runs.
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def serve(listener, port):
    while True:
        client, _ = listener.accept()
        try:
            # Created after the switch back: this socket lives in the servers' namespace.
            upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
            upstream.settimeout(None)
        except OSError as e:
            print(f"forward.py: 127.0.0.1:{port}: {e}", file=sys.stderr, flush=True)
            client.close()
            continue
        done = threading.Barrier(2, action=lambda c=client, u=upstream: (c.close(), u.close()))

        def run(a, b, done=done):
            pump(a, b)
            done.wait()

        threading.Thread(target=run, args=(client, upstream), daemon=True).start()
        threading.Thread(target=run, args=(upstream, client), daemon=True).start()


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: forward.py NETNS_PATH PORT...")
    ports = [int(p) for p in sys.argv[2:]]
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(sys.argv[1], os.O_RDONLY)
    enter(target)
    listeners = []
    for port in ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        listeners.append((s, port))
    enter(home)
    print("forwarding " + " ".join(map(str, ports)), flush=True)
    threads = [
        threading.Thread(target=serve, args=(s, port), daemon=True) for s, port in listeners
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
