import sys

from fx2onnx.cli.main import main

sys.exit(main())
