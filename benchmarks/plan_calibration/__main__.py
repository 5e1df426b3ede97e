import sys

from benchmarks.plan_calibration.run import main

if __name__ == "__main__":  # not in the plan workers, which spawn a fresh interpreter that imports this module
    sys.exit(main())
