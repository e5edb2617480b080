import sys

from ghostgpu.reference import main

raise SystemExit(main(sys.argv[1:]))
