# A variable's value that does not suit its type is reported where the test file sets it.
variables {
  events = "many" # ERROR: The value from the variables block does not suit variable "events"
}
