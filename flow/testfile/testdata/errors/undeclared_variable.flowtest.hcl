# A variable that the pipeline does not declare stops the pipeline from compiling for this file.
variables {
  evnts = 3 # ERROR: A value is given for "evnts", but the pipeline declares no such variable. Did you mean "events"?
}
