pipeline "t" {}
topic "t1" {}
topic "t2" {}
stage "a" {
  kind   = "map"
  input  = topic.t1 # ERROR: Cycle in the pipeline: Messages would flow in a circle: stage.a → topic.t2 → stage.b → topic.t1 → stage.a. This input closes it
  output = topic.t2
  set    = { hop = "a" }
}
stage "b" {
  kind   = "map"
  input  = topic.t2
  output = topic.t1
  set    = { hop = "b" }
}
