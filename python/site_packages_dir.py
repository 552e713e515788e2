"""Prints where Python packages go under an install prefix, relative to it.

Used by python/CMakeLists.txt: the site-packages directory of this interpreter that lies under
the prefix (Debian: lib/python3.X/dist-packages for /usr/local, lib/python3/dist-packages for
/usr), else the interpreter's generic layout for a prefix (lib/python3.X/site-packages).
"""
import os
import site
import sys
import sysconfig

prefix = os.path.normpath(os.path.abspath(sys.argv[1]))
for d in site.getsitepackages():
    rel = os.path.relpath(os.path.normpath(d), prefix)
    if rel.split(os.sep)[0] == "lib":
        print(rel)
        break
else:
    vars = {"base": prefix, "platbase": prefix, "installed_base": prefix, "installed_platbase": prefix}
    print(os.path.relpath(sysconfig.get_path("platlib", "posix_prefix", vars), prefix))
