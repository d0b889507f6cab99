pipeline "t" {}
topic "in" {}
source "s" {
  kind   = "stdin"
  output = topic.in
}
stage "b" {
  kind  = "map"
  input = stage.c # ERROR: Messages would flow in a circle: stage.b → stage.d → stage.c → stage.b. This input closes it
  set   = { hop = "b" }
}
stage "c" {
  kind  = "map"
  input = stage.d
  set   = { hop = "c" }
}
stage "d" {
  kind  = "map"
  input = stage.b
  set   = { hop = "d" }
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
