# References that the pipeline does not resolve, found by Check.
mock "acme.scor" { # ERROR: No go stage of the pipeline calls "acme.scor", so the mock would never be used. Did you mean "acme.score"?
  result { drop = true }
}

override_sink "out" { # ERROR: The sink "out" is a stdout sink. Only http sinks take responses
  responses = [200]
}

override_sink "hoko" { # ERROR: There is no sink named "hoko". Did you mean "hook"?
  responses = [200]
}

run "refs" {
  send {
    topic    = topic.ordres # ERROR: There is no topic named "ordres". Did you mean "orders"?
    messages = [{ id = 1 }]
  }
  send {
    source   = source.score # ERROR: "score" is a stage, not a source: write stage.score.
    messages = [{ id = 1 }]
  }
  expect {
    sink  = sink.outt # ERROR: There is no sink named "outt". Did you mean "out"?
    count = 1
  }
  expect {
    topic = stage.tga # ERROR: There is no stage named "tga". Did you mean "tag"?
    count = 1
  }
  expect_dead_letters {
    sink  = sink.hok # ERROR: There is no sink named "hok". Did you mean "hook"?
    count = 0
  }
  assert {
    condition = length(output.otu) == 0 # ERROR: There is no sink or topic named "otu". Did you mean "out"?
  }
  assert {
    condition = metrics.scor.in > 0 # ERROR: There is no source, stage or sink named "scor". Did you mean "score"?
  }
  assert {
    condition = metrics.score.retired > 0 # ERROR: There is no counter "retired"; the counters are "in", "out", "filtered", "dropped", "absorbed", "dead_lettered", "in_flight", "written", "failed_attempts", "retries", "late", "duplicates". Did you mean "retries"?
  }
  assert {
    condition = length(dead_letters.tga) == 0 # ERROR: Did you mean "tag"?
  }
}

run "own overrides are checked too" {
  mock "acme.scor" { # ERROR: No go stage of the pipeline calls "acme.scor", so the mock would never be used. Did you mean "acme.score"?
    result {}
  }
  override_sink "hoko" { # ERROR: There is no sink named "hoko". Did you mean "hook"?
    responses = [200]
  }
}
