package flow

import "github.com/agext/levenshtein"

// Suggest returns the candidate closest to a misspelt name, or "" when none is close enough to be
// what the user meant. It uses the same distance as hcl's own suggestions, so that all of
// flowrun's "did you mean" hints agree; the command line uses it for names it checks itself, such
// as a topic given as an argument.
func Suggest(given string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if d := levenshtein.Distance(given, c, nil); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// suggest is Suggest, for this package's callers.
func suggest(given string, candidates []string) string { return Suggest(given, candidates) }

// didYouMean formats a suggestion as the end of a diagnostic's detail, or returns "".
func didYouMean(given string, candidates []string) string {
	if s := suggest(given, candidates); s != "" {
		return " Did you mean \"" + s + "\"?"
	}
	return ""
}

// DidYouMean is didYouMean for the checks of kinds declared outside this package.
func DidYouMean(given string, candidates []string) string { return didYouMean(given, candidates) }

// QuotedList is quotedList for the checks of kinds declared outside this package.
func QuotedList(names []string) string { return quotedList(names) }
