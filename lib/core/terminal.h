// Whether output goes to a person at a terminal: the test behind colours and the live progress line.
#pragma once

namespace flowrun {

// True when `fd` is a terminal that a person reads: isatty, TERM is not "dumb", NO_COLOR is unset, and the
// process was not started by mpirun (OpenMPI hands each rank a pseudo-terminal even when mpirun's own output
// goes to a file, so isatty alone would write escape codes into logs).
bool interactive_terminal(int fd);

}  // namespace flowrun
