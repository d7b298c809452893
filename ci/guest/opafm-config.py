#!/usr/bin/env python3
"""Edits opa-fm's packaged opafm.xml for the test guest (ci/build-guest.sh) and writes the result.

    opafm-config.py IN OUT

Every other setting stays as Debian ships it, comments included. Each edit names the element by its path from
<Config>; a path that is not in the file is an error, so a changed upstream layout is noticed at build time.
"""
import sys
import xml.etree.ElementTree as ET

# (path, value). The paths are those of opa-fm 10.10's opafm.xml. An element the file does not have is
# added after the sibling named in INSERT_AFTER.
EDITS = [
    # The PM sweeps over GSI (QP1), which the guest's HFIs carry by SDMA: the SM alone needs only VL15 PIO.
    ("Common/Pm/Start", "0"),
    # No syslogd in the guest: everything goes to a file the init and the user can read.
    ("Common/Shared/LogFile", "/var/log/opafm.log"),
    ("Common/Shared/LogMode", "2"),
    # MinRespTimeout 0: each SMP waits the whole RespTimeout, MaxAttempts times. Under TCG a trapped access costs
    # tens of microseconds and the peer's SMA runs in the same slow guest, so the 35 ms start is too short.
    ("Common/Sm/MinRespTimeout", "0"),
    ("Common/Sm/RespTimeout", "1000"),
]
ZERO_GUID = "<PortGUID>0x0000000000000000</PortGUID>"
INSERT_AFTER = {"Common/Shared/LogFile": "LogLevel"}  # upstream has it commented out just below LogLevel
# Settings the guest relies on that must already be so.
EXPECTED = [
    ("Common/Fe/Start", "0"),      # no Fabric Executive (it wants TLS certificates and a network)
    ("Fm/Shared/Hfi", "1"),        # fm0 runs on the first HFI ...
    ("Fm/Shared/Port", "1"),
    ("Fm/Shared/PortGUID", "0x0000000000000000"),  # ... unless the init names hfi1_0's port GUID at run time
]


def find(root, path):
    """The first element at PATH (the first <Fm> instance is fm0)."""
    el = root.find(path)
    if el is None:
        raise SystemExit(f"opafm-config: {path} is not in the packaged opafm.xml")
    return el


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, dst = sys.argv[1:]
    parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))
    tree = ET.parse(src, parser)
    root = tree.getroot()
    if root.tag != "Config":
        raise SystemExit(f"opafm-config: {src}: root element is <{root.tag}>, not <Config>")
    for path, want in EXPECTED:
        got = (find(root, path).text or "").strip()
        if got != want:
            raise SystemExit(f"opafm-config: {path} is {got!r} in the packaged opafm.xml, expected {want!r}")
    for path, value in EDITS:
        parent_path, _, tag = path.rpartition("/")
        parent = find(root, parent_path)
        el = parent.find(tag)
        if el is None:
            if path not in INSERT_AFTER:
                raise SystemExit(f"opafm-config: {path} is not in the packaged opafm.xml")
            sibling = find(parent, INSERT_AFTER[path])
            el = ET.Element(tag)
            el.tail = sibling.tail
            parent.insert(list(parent).index(sibling) + 1, el)
        el.text = value
    tree.write(dst, encoding="UTF-8", xml_declaration=True)
    with open(dst, "a", encoding="UTF-8") as f:
        f.write("\n")
    # The init names the SM's port by replacing the first <PortGUID> after the first <Fm> (ci/guest/init,
    # opafm_use): that must be fm0's Fm/Shared/PortGUID.
    text = open(dst, encoding="UTF-8").read()
    fm0 = text.find("<Fm>")
    pg = text.find("<PortGUID>", fm0)
    shared = text.find("<Shared>", fm0)
    if not (0 <= fm0 < shared < pg < text.find("</Shared>", shared) and text.startswith(ZERO_GUID, pg)):
        raise SystemExit(f"opafm-config: the first <PortGUID> after <Fm> in {dst} is not fm0's Shared PortGUID")


if __name__ == "__main__":
    main()
