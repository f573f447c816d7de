"""Serving: a trained run exported as a program that loads with torch alone (:mod:`.artifact`,
:mod:`.program`), and the command that scores rows with it (:mod:`.predict`)."""
