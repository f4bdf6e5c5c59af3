"""The form of the compose page."""

from __future__ import annotations

from django import forms


class ComposeForm(forms.Form):
    to = forms.EmailField(label="To", help_text="Any address: the demo delivers every mail to the local SMTP sink.")
    subject = forms.CharField(label="Subject", max_length=200)
    body = forms.CharField(label="Body", widget=forms.Textarea(attrs={"rows": 8, "cols": 60}))
