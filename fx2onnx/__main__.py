import sys

from fx2onnx.cli import main

sys.exit(main())
