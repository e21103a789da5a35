# Sourced from the repository root by scripts/gpu_check.sh and benchmarks/experiments/device_call.sh:
# the wheels carried in .whl/ (the device has no package index; scripts/device_wheels.sh downloads
# them) installed into /tmp/ng-site once a machine (their listing kept beside them: a second run
# beside the first imports the same files; other wheels are installed afresh) and put on PYTHONPATH
# after the checkout. Nothing to do without .whl/; a failed install returns 1.
if ls .whl/*.whl > /dev/null 2>&1; then
  { cmp -s <(ls -l .whl/*.whl) /tmp/ng-site/.installed || { rm -rf /tmp/ng-site && python3 -m pip install -q \
      --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ng-site .whl/*.whl \
      && ls -l .whl/*.whl > /tmp/ng-site/.installed; }; } \
    && export PYTHONPATH=$PWD:/tmp/ng-site
fi
