# Unknown blocks and arguments, with hcl's suggestions, and rules the schema cannot say.
rnu "typo" {} # ERROR: Unsupported block type: Blocks of type "rnu" are not expected here. Did you mean "run"?

mock "acme.score" {
  result {
    eror = "x" # ERROR: An argument named "eror" is not expected here. Did you mean "error"?
  }
  result { permanent = true } # ERROR: Permanent without error
  result {
    drop   = true
    output = msg # ERROR: this one has both drop and output
  }
  result { times = 0 } # ERROR: times takes a whole number of at least 1
  result { output = msg.id + nope } # ERROR: Unknown variable: There is no variable named "nope".
}

mock "acme.score" {} # ERROR: Duplicate mock "acme.score"

override_sink "hook" {
  responses = [200, 42] # ERROR: Each response is an HTTP status code
}

run "a" {
  crash = true # ERROR: put crash = true in a step block
  advance = "5 minutes" # ERROR: Invalid duration
  send { # ERROR: A send block needs one of topic or source.
    messages = [{ id = 1 }]
  }
  send {
    topic    = topic.orders
    source   = source.orders # ERROR: this one has both topic and source
    messages = [{ id = 1 }]
  }
  step {
    advance = "1s"
    send {
      topic = topic.orders
      messages = [
        { payload = { id = 1 }, at = "+2s" }, # ERROR: after the step's advance of 1s ends
        { payload = { id = 2 }, at = "-1s" }, # ERROR: is negative
        { payload = 3 },                      # ERROR: A payload is an object
        "text",                               # ERROR: A message is an object
        { payload = { id = 4 }, key = [] },   # ERROR: A message's key is a string
      ]
    }
    expect {
      sink     = sink.out
      messages = [{ payload = { id = 1 }, at = "1s" }] # ERROR: an expected message has none
      match    = "unorderd"                            # ERROR: "unorderd" is not one of "exact", "unordered", "subset". Did you mean "unordered"?
    }
    expect { sink = sink.out } # ERROR: An expect block needs messages, a file or a count.
    expect {
      topic = orders # ERROR: topic takes a reference written without quotes
      count = 1
    }
    expect {
      sink  = snk.out # ERROR: Did you mean sink.out?
      count = -1      # ERROR: count takes a whole number of at least 0
    }
    expect_dead_letters {
      stage    = stage.score
      messages = [{ reasn = "x" }] # ERROR: An expected dead letter has no field "reasn"
    }
    expect_dead_letters { stage = stage.score } # ERROR: needs a count or messages
    assert {
      condition = outptu.out == [] # ERROR: There is no variable named "outptu". A condition can use output, dead_letters or metrics. Did you mean "output"?
    }
    assert {
      condition = lenght(output.out) == 0 # ERROR: There is no function named "lenght". Did you mean "length"?
    }
    send {
      topic = topic.orders
      file  = "no-such-file.jsonl" # ERROR: Cannot read messages file
    }
  }
}

run "a" {} # ERROR: Duplicate run "a": A run "a" is already declared at

# A run may mock and override what the file does, once each.
run "own overrides" {
  mock "acme.score" {
    result {}
  }
  mock "acme.score" { # ERROR: Duplicate mock "acme.score": A mock "acme.score" is already declared in this run at
    result {}
  }
  override_sink "hook" {
    responses = [503]
  }
  override_sink "hook" { # ERROR: Duplicate override_sink "hook": A override_sink "hook" is already declared in this run at
    responses = [200]
  }
}
