mock "acme.score" {} # ERROR: Missing result block: A mock needs at least one result block
