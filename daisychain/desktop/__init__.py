"""daisychain.desktop"""
